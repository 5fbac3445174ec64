from spark_cluster.cli import main

main()
