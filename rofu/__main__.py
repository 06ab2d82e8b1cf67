"""`python -m rofu ...` is the `rofu` command."""

from rofu.cli import main

raise SystemExit(main())
