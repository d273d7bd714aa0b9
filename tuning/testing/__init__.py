"""Contract suites a plug-in written outside the repository runs from an installed tunelab (pytest):

    tuning.testing.store_contract   StoreContract: a measurement store backend (tuning/store/base.py)
"""
