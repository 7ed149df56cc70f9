from kinetic.cli import main

raise SystemExit(main())
