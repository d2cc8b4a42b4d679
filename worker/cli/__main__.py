"""``python -m worker.cli`` runs the kp-scorer command line."""

import os

from worker.cli.main import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
raise SystemExit(main())
