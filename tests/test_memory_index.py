"""Memory's suffix indexes, proposal trees, bounded document store and its files.

Longest matches are checked against brute force on small random texts (both search paths of the corpus index), the
incremental index against a rebuild, the proposal tree's counts and best-first order by hand-made documents, and the
files for round trips, corruption, fingerprint separation and snapshots.
"""
from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest

from core.memory import store
from core.memory.documents import SuffixMemory
from core.memory.drafter import MemoryDrafter, recency_weights
from core.memory.index import MAX_MATCH, CorpusIndex, LiveIndex
from core.memory.stats import (AGREEMENT_MATCH, BUCKET_LABELS, BUCKET_STARTS, EDITED, KAPPA, MAX_PROB, RECORDED,
                               RESUMED, MemoryStats, bucket, confidence, key)
from core.memory.store import memory_dir, memory_path, open_memory


def brute_longest(docs, suffix):
    """(m, sorted (doc, offset) ends) by trying every position; positions at a document's end have no continuation."""
    best, ends = 0, []
    for di, doc in enumerate(docs):
        for e in range(len(doc) - 1):
            m = 0
            while m < min(len(suffix), MAX_MATCH) and e - m >= 0 and doc[e - m] == suffix[m]:
                m += 1
            if m > best:
                best, ends = m, [(di, e)]
            elif m == best and m:
                ends.append((di, e))
    return best, sorted(ends)


def as_doc_offsets(index: CorpusIndex, ends: np.ndarray) -> list[tuple[int, int]]:
    docs = index.document_of(ends)
    return sorted(zip(docs.tolist(), (ends - index.starts[docs]).tolist()))


@pytest.mark.parametrize("seed", [0, 1])
def test_corpus_longest_match_is_exact(seed: int) -> None:
    rnd = np.random.default_rng(seed)
    docs = [rnd.integers(0, 4, size=rnd.integers(1, 40)) for _ in range(40)]
    docs.append(np.zeros(90, np.int64))   # a long run: matches longer than MAX_MATCH must stop there
    index = CorpusIndex.built(docs)
    for _ in range(300):
        suffix = rnd.integers(0, 4, size=rnd.integers(1, 30)).tolist()
        m, ends = index.longest(suffix)
        want, want_ends = brute_longest(docs, suffix)
        assert m == want
        assert as_doc_offsets(index, ends) == (want_ends if m else [])
    m, ends = index.longest([0] * 100)
    assert m == MAX_MATCH and len(ends) == 90 - MAX_MATCH   # ends 63..88 of the run of 90 zeros


def test_incremental_index_equals_rebuild() -> None:
    rnd = np.random.default_rng(5)
    docs = [rnd.integers(0, 3, size=rnd.integers(1, 60)) for _ in range(60)]
    grown = CorpusIndex.built(docs[:40])
    for doc in docs[40:]:
        grown = grown.appended(doc)          # small documents are binary-searched in
    rebuilt = CorpusIndex.built(docs)
    assert np.array_equal(grown.text, rebuilt.text) and np.array_equal(grown.order, rebuilt.order)
    dropped = rebuilt.without([0, 7, 59])
    kept = CorpusIndex.built([d for i, d in enumerate(docs) if i not in (0, 7, 59)])
    for a, b in ((dropped.text, kept.text), (dropped.order, kept.order), (dropped.starts, kept.starts)):
        assert np.array_equal(a, b)
    assert [d.tolist() for d in docs[1:3]] == [dropped.document(i).tolist() for i in range(2)]


def test_live_index_longest_match_and_resync() -> None:
    rnd = random.Random(3)
    for _ in range(200):
        tokens = [rnd.randrange(3) for _ in range(rnd.randint(1, 50))]
        live = LiveIndex(tokens[:5])
        live.sync(tokens)
        m, ends = live.longest()
        want, want_ends = brute_longest([tokens], tokens[::-1])
        assert m == want and (sorted(ends.tolist()) == [e for _, e in want_ends] if m else len(ends) == 0)
    live = LiveIndex([1, 2, 3, 1, 2])
    live.sync([7, 2, 3, 1, 2, 3])        # not a continuation: indexed afresh
    assert live.suffix() == [3, 2, 1, 3, 2, 7] and live.longest() == (2, pytest.approx([2]))


def propose(memory: SuffixMemory | None, context, max_nodes=16, max_depth=8):
    drafter = MemoryDrafter(memory)
    drafter.start(context)
    return drafter.propose(context, max_nodes, max_depth)


def test_proposal_counts_recency_and_shape() -> None:
    memory = SuffixMemory("fp")
    for doc in ([1, 2, 3, 4, 9], [1, 2, 3, 5, 9], [1, 2, 3, 4, 8], [1, 2, 3, 4, 9]):   # 4 three times, 5 once
        memory.add_document(doc)
    proposal = propose(memory, [7, 1, 2, 3])
    tree = proposal.tree
    assert proposal.match == 3 and proposal.occurrences == 4
    four, five = tree.children(-1)
    assert (tree.tokens[four], tree.tokens[five]) == (4, 5)
    # recency: documents added last come first; the 4s are occurrences 0, 1 and 3, the 5 is occurrence 2
    w = recency_weights(4)
    share_4 = (w[0] + w[1] + w[3]) / w.sum()
    assert proposal.raw_probs[four] == pytest.approx(share_4 * 4 / (4 + KAPPA))
    assert proposal.raw_probs[five] == pytest.approx((1 - share_4) * 4 / (4 + KAPPA))
    earlier = key(3, remembered=True)     # agreement with remembered documents, counted apart from this text's
    assert proposal.node_probs[four] == pytest.approx(MemoryStats().estimate(earlier, proposal.raw_probs[four]))
    # after 4: 9 twice (the latest document among them), 8 once; after 5: 9
    below = key(4, remembered=True)
    assert [(tree.tokens[c], proposal.node_matches[c]) for c in tree.children(four)] == [(9, below), (8, below)]
    assert [tree.tokens[c] for c in tree.children(five)] == [9]
    assert sorted(tree.tokens) == [4, 5, 8, 9, 9]
    for j, parent in enumerate(tree.parents):
        assert parent < j
        siblings = [tree.tokens[c] for c in tree.children(parent)]
        assert len(siblings) == len(set(siblings))
        expected = proposal.node_probs[j] * (proposal.path_probs[parent] if parent >= 0 else 1.0)
        assert proposal.path_probs[j] == pytest.approx(expected)
    assert list(proposal.path_probs) == sorted(proposal.path_probs, reverse=True)
    assert proposal.expected_tokens(2) == pytest.approx(1 + sum(proposal.path_probs[:2]))
    assert proposal.documents(five) == {1}   # the 5 came from the second document (id 1)


def test_agreeing_occurrences_count_only_after_a_short_match() -> None:
    """Two occurrences that go on alike make a node surer than one while the match is short; past
    AGREEMENT_MATCH tokens a node is judged as if one occurrence backed it (core.memory.stats.confidence)."""
    twice, once = SuffixMemory("fp"), SuffixMemory("fp")
    for memory, copies in ((twice, 2), (once, 1)):
        for _ in range(copies):
            memory.add_document([1, 2, 3, 4, 5, 6, 7])
    context = [9, 2, 3]                     # a match of 2: the nodes 4, 5, 6, 7 lie 2, 3, 4 and 5 tokens deep
    assert AGREEMENT_MATCH == 3
    agreed, alone = propose(twice, context), propose(once, context)
    assert agreed.tree.tokens == alone.tree.tokens == [4, 5, 6, 7]
    assert agreed.raw_probs == pytest.approx([2 / 3, 2 / 3, 1 / 2, 1 / 2])
    assert alone.raw_probs == pytest.approx([1 / 2] * 4)
    live = propose(None, [2, 3, 4, 5, 6, 0, 2, 3, 4, 5, 6, 8, 2, 3])    # this text: "2 3 4 5 6" twice, then "2 3"
    assert live.tree.tokens[:4] == [4, 5, 6, 8] and live.raw_probs[:3] == pytest.approx([2 / 3, 2 / 3, 1 / 2])
    for stats_key in (RESUMED, EDITED, RECORDED):     # guesses and recorded probabilities: not match lengths
        assert confidence(3, stats_key) == pytest.approx(3 / (3 + KAPPA))


def test_best_first_prefixes_are_the_best_subtrees() -> None:
    rnd = np.random.default_rng(9)
    memory = SuffixMemory("fp")
    docs = [[5, 6] + rnd.integers(0, 3, size=8).tolist() for _ in range(30)]
    for doc in docs:
        memory.add_document(doc)
    full = propose(memory, [1, 5, 6], max_nodes=40, max_depth=5)
    assert len(full.tree) == 40 and full.tree.max_depth <= 5
    for n in (1, 3, 7, 20):
        small = propose(memory, [1, 5, 6], max_nodes=n, max_depth=5)
        cut = full.tree.truncated(max_nodes=n)
        assert (small.tree.tokens, small.tree.parents) == (cut.tokens, cut.parents)
        assert small.path_probs == full.path_probs[:n]
        # no node outside the prefix is worth more than the prefix's worst (a parent is never worth less)
        assert min(full.path_probs[:n]) >= max(full.path_probs[n:])
    shallow = propose(memory, [1, 5, 6], max_nodes=40, max_depth=2)
    assert shallow.tree.max_depth == 2
    assert len(shallow.tree) == len({tuple(d[2:3]) for d in docs}) + len({tuple(d[2:4]) for d in docs})
    assert len(propose(memory, [1, 5, 6], max_nodes=0).tree) == 0
    assert propose(memory, [1, 2, 4], max_nodes=8).match == 0


def test_live_and_remembered_occurrences_combine() -> None:
    memory = SuffixMemory("fp")
    memory.add_document([3, 4, 6])
    proposal = propose(memory, [3, 4, 5, 0, 3, 4])   # live "3 4 -> 5" and remembered "3 4 -> 6", both match 2
    assert proposal.match == 2 and proposal.tree.tokens[:2] == [5, 6]    # the live text is the most recent
    assert proposal.row_documents == (-1, 0)


def test_stats_buckets_and_calibration() -> None:
    assert [bucket(key(m)) for m in (0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 64)] == [0, 0, 1, 2, 3, 4, 4, 5, 5, 6, 6]
    assert len(BUCKET_STARTS) == 7
    stats = MemoryStats()
    single = 1 / (1 + KAPPA)
    assert stats.estimate(1, single) == pytest.approx(stats.rate(1))   # the prior: one occurrence at its rate
    for _ in range(200):
        stats.observe(12, True, single)
        stats.observe(2, False, single)
    assert stats.estimate(12, single) == MAX_PROB and stats.rate(12) > 0.95
    assert stats.estimate(2, single) < 0.05 and stats.rate(2) < 0.05
    assert stats.rate(1) == MemoryStats().rate(1)   # other buckets untouched
    assert MemoryStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats
    for bad in ({}, {"tested": [1], "accepted": [1], "predicted": [1]},
                {"tested": [-1.0] * 7, "accepted": [0.0] * 7, "predicted": [0.0] * 7}):
        with pytest.raises(ValueError):
            MemoryStats.from_dict(bad)


def test_an_answer_echoing_itself_is_counted_apart_from_a_copy_of_its_prompt() -> None:
    """A match whose latest occurrence lies in the answer being written is keyed in the own answer's buckets, one in
    the prompt in the text at hand's: their evidence never mixes, each generation starts both afresh, and statistics
    written before the own buckets existed load with them empty."""
    prompt = [5, 1, 2, 3, 4, 6]
    drafter = MemoryDrafter(None)
    drafter.start(prompt)
    copying = drafter.propose(prompt + [9, 1, 2], 4, 4)               # `1 2` occurs in the prompt only
    assert copying.match == 2 and all(m == key(2 + d) for d, m in enumerate(copying.node_matches))
    echoing = drafter.propose(prompt + [9, 7, 8, 0, 9, 7], 4, 4)      # `9 7` occurs in the answer only
    assert echoing.match == 2 and echoing.node_matches[0] == key(2, own=True) != key(2)
    assert BUCKET_LABELS[bucket(key(2, own=True))] == "own 2" and BUCKET_LABELS[bucket(key(2))] == "2"
    assert [BUCKET_LABELS[bucket(key(m, own=True))] for m in (1, 8, 9, 17, 40)] == \
        ["own 1", "own 5-8", "own 9-16", "own 17+", "own 17+"]
    assert confidence(3, key(12, own=True)) == confidence(3, key(12)) < confidence(3, key(2, own=True))
    stats = MemoryStats()
    for _ in range(50):
        stats.observe(key(6, own=True), False, 0.5)
    assert stats.rate(key(6, own=True)) < 0.1 and stats.rate(6) == MemoryStats().rate(6)
    stats.forget_this_text()
    assert stats == MemoryStats()
    before = {name: [1.0] * (len(BUCKET_LABELS) - len(BUCKET_STARTS)) for name in ("tested", "accepted", "predicted")}
    loaded = MemoryStats.from_dict(before)
    own_start = bucket(key(1, own=True))
    assert loaded.tested[:own_start] == before["tested"] and sum(loaded.tested[own_start:]) == 0


def test_lru_eviction_keeps_recently_used_documents() -> None:
    memory = SuffixMemory("fp", max_bytes=2048)
    ids = [memory.add_document([i] * 45) for i in range(4)]    # each ~480 bytes: all four fit
    assert memory.documents == 4 and memory.nbytes <= 2048
    memory.touch({ids[0]})                                      # document 0 supplied a draft: now the most recent
    for i in range(4, 6):
        memory.add_document([i] * 45)
    assert memory.nbytes <= 2048
    assert set(memory.state.uids.tolist()) == {ids[0], ids[3], 4, 5}   # 1 and 2 were the least recently used
    with pytest.raises(ValueError, match="does not fit"):
        memory.add_document([1] * 1000)
    assert memory.documents == 4


def test_keyed_documents_are_replaced_and_bad_ones_refused() -> None:
    memory = SuffixMemory("fp")
    memory.add_document([1, 2, 3], key="chat-1", source="conversation")
    memory.add_document([1, 2, 3, 4, 5], key="chat-1", source="conversation")
    assert memory.documents == 1 and memory.tokens == 5
    for bad in ([], [1, -2], [1.5, 2.0], [[1, 2]], [2**40]):
        with pytest.raises(ValueError):
            memory.add_document(bad)
    with pytest.raises(ValueError):
        memory.add_document([1, 2], key=3)
    assert memory.documents == 1 and memory.state.index.document(0).tolist() == [1, 2, 3, 4, 5]
    assert memory.add_answer([9] * 100, []) is None
    memory.add_answer(list(range(100)), [7, 8])
    assert memory.state.index.document(1).tolist() == list(range(100 - MAX_MATCH, 100)) + [7, 8]


@pytest.fixture
def fresh_opens(monkeypatch):
    """open_memory without the memories opened by earlier tests (and reading from disk when asked again)."""
    monkeypatch.setattr(store, "_open", {})


def test_persistence_round_trip(tmp_path, fresh_opens) -> None:
    memory = open_memory("fp-a", tmp_path)
    assert memory.documents == 0 and memory.notice is None
    memory.add_document([1, 2, 3, 4], key="k", source="conversation")
    memory.add_document([5, 6, 7])
    memory.stats.observe(3, True, 0.5)
    assert memory.save()
    assert open_memory("fp-a", tmp_path) is memory          # unchanged file: the same object
    store._open.clear()
    again = open_memory("fp-a", tmp_path)
    assert again is not memory
    s, t = memory.state, again.state
    for a, b in ((s.index.text, t.index.text), (s.index.order, t.index.order), (s.uids, t.uids),
                 (s.stamps, t.stamps)):
        assert np.array_equal(a, b)
    assert (t.keys, t.sources, t.clock, t.next_uid) == (s.keys, s.sources, s.clock, s.next_uid)
    assert again.stats == memory.stats
    assert propose(again, [0, 1, 2]).tree.tokens == propose(memory, [0, 1, 2]).tree.tokens == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([memory_path(tmp_path, "fp-a").name, "stats.json"])


@pytest.mark.parametrize("damage", ["flipped", "truncated", "oversized", "garbage", "other-tokenizer"])
def test_unusable_file_starts_empty_and_nothing_else_is_lost(tmp_path, fresh_opens, caplog, damage: str) -> None:
    a, b = open_memory("fp-a", tmp_path), open_memory("fp-b", tmp_path)
    a.add_document(list(range(1, 10_000)))
    b.add_document([9, 8, 7, 6])
    a.stats.observe(5, True, 0.5)
    assert a.save() and b.save()
    path_a, path_b = memory_path(tmp_path, "fp-a"), memory_path(tmp_path, "fp-b")
    stats_before = (tmp_path / "stats.json").read_bytes()
    b_before = path_b.read_bytes()
    data = path_a.read_bytes()
    max_bytes = a.max_bytes
    if damage == "flipped":
        middle = len(data) // 2
        path_a.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    elif damage == "truncated":
        path_a.write_bytes(data[: len(data) // 3])
    elif damage == "oversized":
        max_bytes = 1024       # the file (80 kB) is far beyond this limit
    elif damage == "garbage":
        path_a.write_bytes(b"not a memory")
    else:
        path_a.write_bytes(path_b.read_bytes())
    store._open.clear()
    with caplog.at_level(logging.WARNING):
        damaged = open_memory("fp-a", tmp_path, max_bytes=max_bytes)
    assert damaged.documents == 0 and damaged.notice and "starts empty" in damaged.notice
    assert any("starts empty" in r.getMessage() for r in caplog.records)
    assert damaged.stats.tested[damaged.stats.tested.index(max(damaged.stats.tested))] > 0   # statistics kept
    assert open_memory("fp-b", tmp_path).state.index.document(0).tolist() == [9, 8, 7, 6]
    assert path_b.read_bytes() == b_before and (tmp_path / "stats.json").read_bytes() == stats_before
    damaged.add_document([1, 2])
    assert damaged.save()
    store._open.clear()
    assert open_memory("fp-a", tmp_path, max_bytes=max_bytes).documents == 1
    assert path_b.read_bytes() == b_before


def test_unreadable_statistics_keep_the_documents(tmp_path, fresh_opens) -> None:
    memory = open_memory("fp", tmp_path)
    memory.add_document([1, 2, 3])
    memory.save()
    (tmp_path / "stats.json").write_text("{broken")
    store._open.clear()
    again = open_memory("fp", tmp_path)
    assert again.documents == 1 and "statistics" in again.notice and again.stats == MemoryStats()
    assert again.save()
    assert json.loads((tmp_path / "stats.json").read_text())   # rewritten whole


def test_fingerprints_are_separate(tmp_path, fresh_opens) -> None:
    a = open_memory("tokenizer-a", tmp_path)
    a.add_document([1, 2, 3, 4])
    a.save()
    b = open_memory("tokenizer-b", tmp_path)
    assert b.documents == 0 and propose(b, [1, 2, 3]).match == 0
    assert propose(a, [1, 2, 3]).tree.tokens == [4]


def test_snapshot_restore_and_read_only(tmp_path, fresh_opens) -> None:
    memory = open_memory("fp", tmp_path)
    first = memory.add_document([1, 2, 3, 4])
    memory.save()
    before = memory.snapshot()
    tokens_before = propose(memory, [0, 2, 3]).tree.tokens
    memory.add_document([2, 3, 5, 5])
    memory.touch({first})
    memory.stats.observe(2, False, 0.5)
    assert propose(memory, [0, 2, 3]).tree.tokens != tokens_before
    memory.restore(before)
    assert memory.documents == 1 and memory.stats == MemoryStats()
    assert propose(memory, [0, 2, 3]).tree.tokens == tokens_before
    frozen = open_memory("fp", tmp_path, read_only=True)
    assert frozen is not memory and frozen.documents == 1
    frozen.add_document([7, 7, 7])
    on_disk = memory_path(tmp_path, "fp").read_bytes()
    assert not frozen.save() and memory_path(tmp_path, "fp").read_bytes() == on_disk


def test_memory_folder_follows_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SPECLENS_MEMORY_DIR", raising=False)
    monkeypatch.setenv("SPECLENS_DATA_DIR", str(tmp_path / "data"))
    assert memory_dir() == tmp_path / "data" / "memory"
    monkeypatch.setenv("SPECLENS_MEMORY_DIR", str(tmp_path / "mem"))
    assert memory_dir() == tmp_path / "mem"
    monkeypatch.delenv("SPECLENS_MEMORY_DIR")
    monkeypatch.delenv("SPECLENS_DATA_DIR")
    assert memory_dir().name == "memory" and "speclens" in str(memory_dir()).lower()
