"""Contract suites a plug-in written outside the repository runs from an installed tunelab (pytest):

    tuning.testing.store_contract   StoreContract: a measurement store backend (tuning/store/base.py)
    tuning.testing.runner_contract  RunnerContract: a runner, how a TVM backend reaches its devices
                                    (tuning/hardware/runners/base.py)
    tuning.testing.search_contract  SearchContract: a search strategy (tuning/search/base.py), on
                                    synthetic spaces
"""
