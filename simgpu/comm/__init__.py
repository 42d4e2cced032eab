"""Communication: collective algorithms as transfer plans, and links shared by transfers."""

from .plan import CollectivePlan, CollectiveRequest, Transfer
from .planner import Planner

__all__ = ["CollectivePlan", "CollectiveRequest", "Planner", "Transfer"]
