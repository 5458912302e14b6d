"""The real ``tritonserver`` on loopback, as the SageMaker Triton container runs it in MME mode.

The server comes from the PyPI package ``nvidia-pytriton`` (Triton 2.51, the 24.10 release), which
``make setup`` installs into its own environment, ``.venv-triton``, made with the system Python 3.11:
the python backend's stub links that Python's ``libpython3.11.so`` and runs on it (with the
environment of the first ``python3`` on ``PATH``), and the package pins ``numpy<2`` (the project
venv has numpy 2, with which every python-backend response came back empty). The environment also holds ONNX Runtime 1.19 (the
version Triton 24.10's onnxruntime backend ships) and torch for the python-based backends.

Started the way ``docker/sagemaker/serve`` starts it on a multi-model endpoint: SageMaker API only
(``--allow-sagemaker --model-control-mode=explicit --model-namespacing``), HTTP, gRPC and metrics
off, the python backend's shared memory from the same settings the stack gives the container
(:func:`stack_shm_settings`: the app's ``cdk.json``, else the endpoint's defaults).

The server runs in its own session (a signal to the caller's group does not reach it first) and
dies with the process that started it: ``PR_SET_PDEATHSIG`` (Linux) sends it SIGTERM when that
process dies, also by SIGKILL, so no ``tritonserver`` or stub outlives the endpoint.

Where the host allows it, the server runs in a network namespace of its own, reached through a
Unix socket in the work folder (:mod:`~triton_mme_cdk.model_build.tools.local_endpoint.triton_netns`): its
SageMaker port, which Triton opens on every interface, is then reachable from nowhere else.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.text_ensemble.shm import (
    SHM_DEFAULT_BYTE_SIZE,
    SHM_DEFAULT_KEY,
    SHM_GROWTH_BYTE_SIZE,
    SHM_GROWTH_KEY,
    SHM_MAX_BYTE_SIZE,
)
from triton_mme_cdk.model_build.tools.app_context import AppConfig, checkout_root, whole_number
from triton_mme_cdk.model_build.tools.local_endpoint import triton_netns

#: Where ``make setup`` puts the triton environment (in the checkout); ``MME_TRITON_ENV`` points elsewhere.
ENV_FOLDER = ".venv-triton"
ENV_VARIABLE = "MME_TRITON_ENV"
BACKENDS_SOURCE = Path(__file__).resolve().parent / "triton_backends"
#: The python-based backends this project provides (the C++ ones are not in the package).
PYTHON_BASED_BACKENDS = ("onnxruntime", "pytorch")
STARTUP_SECONDS = 60.0
#: What the server said when it started: ``| server_version | 2.51.0 |``.
_VERSION = re.compile(r"server_version\s*\|\s*([0-9.]+)")


class TritonEnvironmentError(ModelBuildError):
    """The triton environment is missing or incomplete: says what to run."""


def default_root() -> Path:
    """The checkout's ``.venv-triton`` (``make setup``), or, installed from a wheel, the current
    directory's (the app's folder)."""
    return (checkout_root() or Path.cwd()) / ENV_FOLDER


@dataclass(frozen=True)
class TritonEnvironment:
    """Paths inside an installed ``nvidia-pytriton``."""

    root: Path
    site_packages: Path

    @property
    def package(self) -> Path:
        return self.site_packages / "pytriton" / "tritonserver"

    @property
    def binary(self) -> Path:
        return self.package / "bin" / "tritonserver"

    @property
    def libraries(self) -> Path:
        return self.site_packages / "nvidia_pytriton.libs"

    @property
    def python_version(self) -> str:
        return self.site_packages.parent.name.removeprefix("python")

    @property
    def python_library_dirs(self) -> list[Path]:
        """Folders beside the environment's base Python that hold its ``libpython3.X.so.1.0``
        (a Python installed in its own prefix, not the system's): the stub links that library."""
        home = ""
        with suppress(OSError):
            for line in (self.root / "pyvenv.cfg").read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home":
                    home = value.strip()
        library = f"libpython{self.python_version}.so.1.0"
        return [folder for folder in ([Path(home).parent / "lib"] if home else []) if (folder / library).is_file()]

    def missing_libpython(self, inherited: str | None = None) -> str:
        """Why the python backend stub cannot start here ("" when its libpython is found): looked
        for along the server's library path (:func:`library_path`, with ``inherited`` or this
        process's ``LD_LIBRARY_PATH``), then in the loader's cache."""
        library = f"libpython{self.python_version}.so.1.0"
        path = library_path(self, os.environ.get("LD_LIBRARY_PATH", "") if inherited is None else inherited)
        if any((Path(folder) / library).is_file() for folder in path.split(os.pathsep)):
            return ""
        with suppress(OSError, subprocess.SubprocessError):
            # /sbin is off a non-root user's default PATH on Debian
            ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
            listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
            if library in listed:
                return ""
        return (f"no {library} on this machine: the python backend stub links the shared library of the "
                f"environment's Python {self.python_version} (Debian/Ubuntu: apt-get install libpython{self.python_version})")

    @classmethod
    def find(cls, root: Path | None = None) -> TritonEnvironment:
        """``root``, else ``$MME_TRITON_ENV``, else :func:`default_root`."""
        root = Path(root or os.environ.get(ENV_VARIABLE) or default_root())
        candidates = sorted(root.glob("lib/python3.*/site-packages"))
        if not candidates or not (candidates[0] / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
            how = ("run `make setup` to install it" if checkout_root() is not None else
                   "make one with Python 3.11 from the repository's requirements-triton.txt (nvidia-pytriton, "
                   "numpy<2, ONNX Runtime 1.19, torch; docs/local-endpoint.md)")
            raise TritonEnvironmentError(f"no tritonserver in {root} (set {ENV_VARIABLE} to another environment); {how}")
        return cls(root=root, site_packages=candidates[0])

    def assemble_backends(self, dest: Path) -> Path:
        """``dest/python`` (backend + stub) and the python-based ``onnxruntime`` / ``pytorch``."""
        python = dest / "python"
        python.mkdir(parents=True)
        shutil.copy2(self.package / "backends" / "python" / "libtriton_python.so", python / "libtriton_python.so")
        shutil.copy2(self.package / "backends" / "python" / "triton_python_backend_utils.py",
                     python / "triton_python_backend_utils.py")
        stub = self.package / "python_backend_stubs" / self.python_version / "triton_python_backend_stub"
        if not stub.is_file():
            raise TritonEnvironmentError(f"no python backend stub for Python {self.python_version} in {stub.parent}")
        shutil.copy2(stub, python / stub.name)
        for backend in PYTHON_BASED_BACKENDS:
            target = dest / backend
            target.mkdir()
            shutil.copy2(BACKENDS_SOURCE / backend / "model.py", target / "model.py")
            shutil.copy2(BACKENDS_SOURCE / "local_backend_common.py", target / "local_backend_common.py")
        return dest


class TritonServerError(ModelBuildError):
    """The server did not start or stopped answering."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as error:
            raise TritonServerError(f"port {port}: not available ({error.strerror}); pick another with --port") from None


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON: the server answers JSON on success and ``{"error": ...}`` on failure."""
        return json.loads(self.body)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket: the server in its own network namespace (``triton_netns``)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class TritonServer:
    """A running ``tritonserver`` with the SageMaker API on ``127.0.0.1:<port>``, or behind the Unix
    socket ``unix_socket`` where it runs in a network namespace of its own.

    Triton 2.51 binds its SageMaker port on all interfaces (it has no address option for it). In
    its own namespace those are the namespace's loopback alone; without one (``isolated`` false)
    the port is open on every interface of the machine, and the local endpoint says so.
    """

    def __init__(self, process: subprocess.Popen[bytes], port: int, log_path: Path, version: str,
                 unix_socket: Path | None = None) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self.version = version
        self.unix_socket = unix_socket
        #: Whether nothing but this process can reach the server (its own network namespace).
        self.isolated = unix_socket is not None
        self.url = f"http+unix://{unix_socket}" if unix_socket is not None else f"http://127.0.0.1:{port}"
        self._local = threading.local()

    def request(self, method: str, path: str, body: bytes | None = None, *,
                headers: dict[str, str] | None = None, timeout: float = 600.0) -> Response:
        """One call to the server; HTTP errors are answers too (the caller reads the status).

        Each thread keeps its connection open between calls, as SageMaker's front keeps its own to
        the container: a new connection per call was 0.3 ms of the 1.1 ms the local endpoint
        added to an invocation (measured on 2 cores). A kept connection the server closed while it
        was idle fails before the request reaches the server; that call is sent once more on a new
        connection (a load sent twice answers 409, which counts as loaded).
        """
        for attempt in (1, 2):
            connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
            reused = connection is not None
            if connection is None:
                connection = (_UnixConnection(self.unix_socket, timeout) if self.unix_socket is not None
                              else http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout))
                self._local.connection = connection
            try:
                if connection.sock is not None:
                    connection.sock.settimeout(timeout)
                connection.timeout = timeout
                connection.request(method, path, body=body, headers=headers or {})
                answer = connection.getresponse()
                data = answer.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop(connection)
                if reused and attempt == 1:
                    continue
                raise
            except BaseException:
                self._drop(connection)
                raise
            if answer.will_close:
                self._drop(connection)
            return Response(answer.status, dict(answer.getheaders()), data)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _drop(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        self._local.connection = None

    def log_tail(self, lines: int = 20) -> str:
        with suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def alive(self) -> bool:
        return self.process.poll() is None


def library_path(env: TritonEnvironment, inherited: str) -> str:
    """The server's ``LD_LIBRARY_PATH``: pytriton's bundled libraries and the stub's libpython
    first, then the caller's own. A GPU container often reaches the driver's ``libcuda.so.1``
    only through that inherited path (``/usr/local/nvidia/lib64``); dropping it would leave the
    stub's CUDA providers without a driver."""
    folders = [str(folder) for folder in (env.libraries, *env.python_library_dirs)]
    return os.pathsep.join([*folders, *(part for part in inherited.split(os.pathsep) if part and part not in folders)])


def _command(env: TritonEnvironment, backends: Path, repository: Path, port: int,
             shm_default_byte_size: int, shm_growth_byte_size: int, log_verbose: int) -> list[str]:
    return [
        str(env.binary),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        "--model-control-mode=explicit",
        "--allow-sagemaker=true",
        f"--sagemaker-port={port}",
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--model-namespacing=true",
        "--exit-timeout-secs=10",
        f"--backend-config=python,shm-default-byte-size={shm_default_byte_size}",
        f"--backend-config=python,shm-growth-byte-size={shm_growth_byte_size}",
        f"--log-verbose={log_verbose}",
    ]


def _wait_ready(server: TritonServer, deadline: float) -> None:
    while time.monotonic() < deadline:
        if not server.alive():
            raise TritonServerError(f"tritonserver exited with status {server.process.returncode}:\n{server.log_tail()}")
        with suppress(OSError):
            if server.request("GET", "/ping", timeout=2).status == 200:
                return
        time.sleep(0.1)
    raise TritonServerError(f"tritonserver did not answer /ping within {STARTUP_SECONDS:g} s:\n{server.log_tail()}")


#: ``prctl(PR_SET_PDEATHSIG, ...)``: the signal the kernel sends the server when its parent dies.
_PR_SET_PDEATHSIG = 1
#: SIGTERM, not SIGKILL: the server then shuts down as on ``stop_process`` (unloads its models,
#: stops the python backend's stubs, removes their ``/dev/shm`` regions), bounded by
#: ``--exit-timeout-secs``; a SIGKILL would leave the stubs' shared memory behind.
PARENT_DEATH_SIGNAL = signal.SIGTERM


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` that ties the server's life to this process (Linux; elsewhere it does nothing).

    The kernel signals the child when the *thread* that started it exits: start the server from
    the thread that lives as long as the endpoint (the main thread, in the command and the tests).
    """

    def apply() -> None:
        if not sys.platform.startswith("linux"):
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0) != 0:
            os._exit(111)  # cannot promise to die with the parent: do not start at all
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os._exit(112)

    return apply


def stop_process(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after ``grace`` seconds.

    The group takes the python backend's stub processes with it: nothing outlives the endpoint.
    """
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextmanager
def triton_server(
    *,
    work_dir: Path,
    port: int | None = None,
    shm_default_byte_size: int | None = None,
    shm_growth_byte_size: int | None = None,
    log_verbose: int = 0,
    env: TritonEnvironment | None = None,
    isolate: bool | None = None,
) -> Iterator[TritonServer]:
    """Start ``tritonserver`` for the block; stop it and its stubs after, whatever happened.

    Shared-memory sizes left out are the ones the stack gives the container
    (:func:`stack_shm_settings`), so every local server runs python models as the endpoint does.
    ``isolate`` (default: where the host allows it, :func:`triton_netns.available`) runs it in a
    network namespace of its own; ``True`` where the host refuses one is an error.
    """
    if shm_default_byte_size is None or shm_growth_byte_size is None:
        stack_default, stack_growth = stack_shm_settings()
        shm_default_byte_size = stack_default if shm_default_byte_size is None else shm_default_byte_size
        shm_growth_byte_size = stack_growth if shm_growth_byte_size is None else shm_growth_byte_size
    env = env or TritonEnvironment.find()
    isolate = triton_netns.available() if isolate is None else isolate
    if isolate and not triton_netns.available():
        raise TritonServerError("this host refuses a network namespace of the server's own "
                                "(unshare --user --map-root-user --net); start it without isolation")
    port = port or free_port()
    if not isolate:
        check_port_free(port)
    backends = env.assemble_backends(work_dir / "backends")
    repository = work_dir / "repository"
    repository.mkdir()
    log_path = work_dir / "tritonserver.log"
    command = _command(env, backends, repository, port, shm_default_byte_size, shm_growth_byte_size, log_verbose)
    unix_socket = work_dir / "tritonserver.sock" if isolate else None
    if unix_socket is not None:
        command = triton_netns.command(command, unix_socket, port)
    # The python backend's stub embeds the system Python and takes the first ``python3`` on PATH
    # as its executable, virtualenv included: the triton environment's ``bin`` goes first, so every
    # python model runs with that environment (numpy 1.26, ONNX Runtime 1.19, torch), never with
    # the project venv a caller may have put first (numpy 2 there breaks the python backend).
    environment = {**os.environ, "LD_LIBRARY_PATH": library_path(env, os.environ.get("LD_LIBRARY_PATH", "")),
                   "PATH": f"{env.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   preexec_fn=_die_with_parent(os.getpid()))
    server = TritonServer(process, port, log_path, version="?", unix_socket=unix_socket)
    try:
        _wait_ready(server, time.monotonic() + STARTUP_SECONDS)
        match = _VERSION.search(log_path.read_text(errors="replace"))
        server.version = match.group(1) if match else "?"
        yield server
    finally:
        stop_process(process)


def stack_shm_settings(folder: Path | None = None) -> tuple[int, int]:
    """The python backend's SHM sizes the stack gives the container: ``mme:shm_default_byte_size``
    and ``mme:shm_growth_byte_size`` of the app's ``cdk.json`` (in ``folder``, default the current
    directory: the app's folder), each the endpoint's default (:mod:`~triton_mme_cdk.model_build.
    text_ensemble.shm`) where it is not set. A value the stack would refuse is one error line
    naming the key and the file."""
    config = AppConfig.find(folder)
    expected = f"a whole number of bytes from 1 to {SHM_MAX_BYTE_SIZE}"
    check = whole_number(1, SHM_MAX_BYTE_SIZE)
    return (config.setting(SHM_DEFAULT_KEY, SHM_DEFAULT_BYTE_SIZE, check, expected),
            config.setting(SHM_GROWTH_KEY, SHM_GROWTH_BYTE_SIZE, check, expected))


@contextmanager
def temporary_dir(prefix: str) -> Iterator[Path]:
    """A work folder removed on exit (also when the block is left by a signal turned exception)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

