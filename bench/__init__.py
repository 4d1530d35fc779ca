"""Throughput bench: bucketq vs keuss bucket-mongo-safe vs a naive one-document-per-message queue vs the
floor (bare insert_many of bucket documents, orjson alone). ``python -m bench [--quick]``; see README.md."""
