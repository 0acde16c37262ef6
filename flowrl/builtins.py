"""Import the built-in heads, rewards, data sources and environments (registration)."""
import flowrl.algorithms  # noqa: F401
import rewards  # noqa: F401  (every reward model registers on import)
import flowrl.testing  # noqa: F401
import flowrl.heads.t2i  # noqa: F401
import planners.driving  # noqa: F401
import planners.robot  # noqa: F401  (robot head, metaworld data source)
