"""The `flashdraft` command line: the app, shared options, the live console, the config reference."""
