// Runs one handler of a Node.js Lambda function's staged code, as Lambda's Node.js runtime would:
// the event on stdin, the function's environment in process.env; prints one line
// {"__lambda__": {"result": ...}} or {"__lambda__": {"error": {errorType, errorMessage, trace}}}
// (the error document of Lambda's Node.js runtime). Used by tests/local_lambda.py for the CDK
// provider framework's functions (framework.onEvent, framework.isComplete, framework.onTimeout).
"use strict";
const path = require("path");

const [codeDir, handler] = process.argv.slice(2);
const dot = handler.lastIndexOf(".");
const module_ = require(path.join(codeDir, handler.slice(0, dot)));
const fn = module_[handler.slice(dot + 1)];

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", async () => {
  let answer;
  try {
    const result = await fn(JSON.parse(input || "{}"));
    answer = { result: result === undefined ? null : result };
  } catch (error) {
    answer = { error: { errorType: error.name || "Error", errorMessage: String(error.message),
                        trace: String(error.stack || "").split("\n") } };
  }
  process.stdout.write("\n" + JSON.stringify({ __lambda__: answer }) + "\n");
});
