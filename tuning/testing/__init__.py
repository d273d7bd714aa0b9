"""Contract suites a plug-in written outside the repository runs from an installed tunelab (pytest):

    tuning.testing.store_contract       StoreContract: a measurement store backend (tuning/store/base.py)
    tuning.testing.runner_contract      RunnerContract: a runner, how a TVM backend reaches its devices
                                        (tuning/hardware/runners/base.py)
    tuning.testing.search_contract      SearchContract: a search strategy (tuning/search/base.py), on
                                        synthetic spaces
    tuning.testing.sampler_contract     SamplerContract: a sampler (tuning/sampler/base.py), on
                                        synthetic spaces
    tuning.testing.cost_model_contract  CostModelContract: a cost model (tuning/cost_model/base.py), fit
                                        on synthetic measurements
    tuning.testing.evaluator_contract   EvaluatorContract: an evaluator (tuning/evaluator/base.py), on
                                        the synthetic hardware
    tuning.testing.hardware_contract    HardwareContract: a hardware, a device measured on
                                        (tuning/hardware/base.py); the synthetic one passes it
"""
