"""One frozen dataclass per stage. Defaults are the paper's.

Each field is documented once, in the ``metadata["help"]`` of the field; the Typer options of
``srollout.cli`` take their help text from there (``help_for``), so CLI and library agree.
Paper defaults: K=10, d_L=0.12, G=8, T_max=30, temperature 0.7, precision floor 0.80.
"""

# One module per group of stages; the configs and the paper's defaults are importable from here.
from srollout.config.analysis import (  # noqa: F401
    AnalyzeConfig,
    GateFitConfig,
    StallFitConfig,
    SweepConfig,
    WhatIfConfig,
)
from srollout.config.common import (  # noqa: F401
    AUDIT_PRECISION_FLOOR,
    PAPER_D_L,
    PAPER_G,
    PAPER_K,
    PAPER_K_VALUES,
    PAPER_PRECISION_FLOOR,
    PAPER_T_MAX,
    PAPER_TEMPERATURE,
    doc,
    help_for,
    parse_grid,
    parse_int_list,
    parse_names,
    parse_seeds,
)
from srollout.config.rollout import (  # noqa: F401
    AB_ARMS,
    QUICK_GROUPS,
    QUICK_T_MAX,
    AbRolloutConfig,
    CollectConfig,
    DistConfig,
    RolloutOptions,
    ServeConfig,
)
from srollout.config.training import (  # noqa: F401
    ONPOLICY_PRESETS,
    TRAIN_ARMS,
    TrainOffpolicyConfig,
    TrainOnpolicyConfig,
)
