"""The `guestfs` commands: show and explain (cli, explain), mount, run, attach and the OCI
hook, each over the shared helpers in guestfs.system."""
