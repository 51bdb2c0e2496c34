"""What FrogFix writes for people on the forge: the MR's title and description, the commit
message, comments, and the link-free text of a question.

- `mr_text`: the MR and comment Markdown, made inert, with the evidence and provenance tables.
- `linkless`: text with no link a forge would render (what a question to the issue may carry).

Room rule (tests/test_import_graph.py): may import `worker.attempts` (the evidence it words) and
`worker.leaf`; never the job core or the commands.
"""
