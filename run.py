"""tunelab entry point in a checkout: `python run.py search=sa sampler=greedy model=conv_l8 budget.trials=64`
is `tunelab run search=sa ...` (tunelab/run.py)."""
from tunelab.run import main

if __name__ == "__main__":
    main()
