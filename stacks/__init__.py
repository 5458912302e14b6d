"""The CDK stacks of the app and their typed settings (``stacks.settings``)."""
