"""Train a minillm model from the Hydra config in configs/ (``python train.py --help`` lists the groups).

The checkout's entry point; the same ``main`` is installed as the console script ``minillm-train``. The code
lives in minillm/training/train.py.
"""

import sys

try:
    from minillm.training.train import main
except KeyboardInterrupt:  # torch, Lightning and Hydra take seconds to import: a Ctrl-C there is one line
    print("stopped by SIGINT (Ctrl-C) while Python imported minillm's libraries: nothing ran, nothing was written",
          file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    main()
