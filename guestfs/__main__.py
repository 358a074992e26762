from guestfs.cli import main

raise SystemExit(main())
