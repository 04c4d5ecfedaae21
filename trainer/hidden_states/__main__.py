"""`python -m trainer.hidden_states`: the same as `nodedeck-train hidden-states`."""

import sys

from trainer.hidden_states.cli import main

sys.exit(main())
