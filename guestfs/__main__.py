from guestfs.commands.cli import main

raise SystemExit(main())
