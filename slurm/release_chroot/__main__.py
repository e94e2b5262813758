"""`python -m slurm.release_chroot`: see `slurm.release_chroot.cli`."""

import sys

from slurm.release_chroot.cli import main

sys.exit(main())
