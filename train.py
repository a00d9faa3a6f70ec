"""Train a minillm model from the Hydra config in configs/ (``python train.py --help`` lists the groups).

The checkout's entry point; the same ``main`` is installed as the console script ``minillm-train``. The code
lives in minillm/train.py.
"""

from minillm.train import main

if __name__ == "__main__":
    main()
