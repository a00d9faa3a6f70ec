"""Train a minillm model from the Hydra config in configs/ (``python train.py --help`` lists the groups).

The checkout's entry point; the same ``main`` is installed as the console script ``minillm-train``. The code
lives in minillm/training/train.py.
"""

from minillm.training.entry import main  # a Ctrl-C while it imports torch, Lightning and Hydra is one line

if __name__ == "__main__":
    main()
