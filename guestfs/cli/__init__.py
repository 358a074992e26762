"""The `guestfs` command: its parser and each subcommand's entry (main.py), the options
they share (options.py), and explain's text and JSON (explain.py). It sits above every
other stage and is the only one that may import them all."""
