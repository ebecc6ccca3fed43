"""Auto: measure the machine once, then choose every step what pays. One job per module: ``costs`` (the cost model),
``plan`` (what was measured and chosen, as data), ``calibrate`` (measuring, the one part that runs the models),
``cache`` (plans on disk), ``estimates`` (what is learned while decoding), ``policy`` (the per-step choice),
``strategy`` (the Strategy the engine binds), ``cli`` (`speclens plan`)."""
from core.auto.plan import Plan, plan_key
from core.auto.strategy import Auto, attach_memory, get_plan

__all__ = ["Auto", "Plan", "attach_memory", "get_plan", "plan_key"]
