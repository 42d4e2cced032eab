"""Communication: collective algorithms as transfer plans, and links shared by transfers."""

from .plan import CollectivePlan, CollectiveRequest
from .planner import Planner
from .transfers import Transfer

__all__ = ["CollectivePlan", "CollectiveRequest", "Planner", "Transfer"]
