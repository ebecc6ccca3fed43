"""Drafts from memory: a suffix index over this text and remembered documents (earlier conversations and answers),
proposing a token tree of the likeliest continuations of the longest earlier match. See drafter.py."""
from core.memory.documents import DEFAULT_MAX_BYTES, PROMPT_TAIL, MemorySnapshot, SuffixMemory
from core.memory.drafter import Memory, MemoryDrafter
from core.memory.proposal import MemoryProposal
from core.memory.stats import MemoryStats
from core.memory.store import memory_dir, open_memory

__all__ = ["DEFAULT_MAX_BYTES", "PROMPT_TAIL", "Memory", "MemoryDrafter", "MemoryProposal", "MemorySnapshot",
           "MemoryStats", "SuffixMemory", "memory_dir", "open_memory"]
