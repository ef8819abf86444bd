"""Replay traces built from the evaluation data in ../shared/data for calibration and benchmarks.

A trace is JSONL, one conversation a line: {"id", "category", "tenant", "session", "system",
"turns": [{"user", "key", "answer"?, "expect"?: "no_hit", "regenerate"?: true}]}. Turns with the
same key may share an answer; different keys must not.

Keys are derived, not invented: a turn's own key hashes the system prompt and every user turn up
to it, so two turns with the same context and text always get the same key (an oracle keyed by
prefix never sees one prefix with two keys) and the same words in another context never do. Only
a turn the data says means the same (a paraphrase, a restated follow-up, a repeat) borrows an
earlier key. Data rows are read at run time and never copied into the repository; rows that the
replay harness's development traces (../eval/dev_traces.jsonl) already use are skipped, so that set stays an
independent check of what these traces calibrate.
"""
