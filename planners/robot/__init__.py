"""MetaWorld robot world: env wrapper, expert data sources, action-chunk head, PTR scorer.

Importing registers the ``robot`` head, the ``metaworld`` data source (with its per-window
weighting: uniform / oracle / filtered / awr / ptr, see ``weighting``) and the ``metaworld``
closed-loop environment. MetaWorld itself (the ``robot`` extra) is imported only when an
environment or the experts are used. Committed pretrained heads: ``pretrained/velocity``
(configs/robot/pretrain.yaml) and ``pretrained/epsilon`` (configs/robot/pretrain_ddim.yaml).
"""
from planners.robot import data, envs, head  # noqa: F401  (registration)
