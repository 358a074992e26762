from guestfs.cli.main import main

raise SystemExit(main())
