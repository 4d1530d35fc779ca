from bucketq.cli import main

main()
