from opforge.cli import main

raise SystemExit(main())
