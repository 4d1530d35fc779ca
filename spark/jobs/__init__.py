"""Example Spark jobs over bucketq queues (not shipped: the installed package is ``bucketq_spark``)."""
