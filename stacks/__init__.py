"""The CDK stacks of the app and their typed settings (``stacks.settings``)."""

if __name__ == "stacks":  # the checkout's folder by its own name: `python -m` is refused (triton_mme_cdk.checkout)
    from triton_mme_cdk.checkout import run_by_folder_name

    run_by_folder_name("stacks")
