"""gte-pro's config schemas (gte_pro/config/schema/) in Hydra's ConfigStore.

Hydra imports every module under ``hydra_plugins`` before it composes a config, so ``python train.py``, sweeps,
the launchers and the compose API of the tests all find ``schema/<group>/<option>`` without importing gte_pro first.
"""

from gte_pro.config.schema import register_schemas

register_schemas()
