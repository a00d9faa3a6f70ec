"""Train a minillm model from the Hydra config in configs/ (``python train.py --help`` lists the groups).

The checkout's entry point; the same ``main`` is installed as the console script ``minillm-train``. The code
lives in minillm/training/train.py.
"""

from minillm.training.train import main

if __name__ == "__main__":
    main()
