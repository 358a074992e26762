"""The `guestfs` commands: show and explain (cli, explain), mount, run (with its supervisor,
the app's privileges and OOM order), attach and the OCI hook. They share helpers through
guestfs.daemon.mountpoint and guestfs.system rather than importing each other."""
