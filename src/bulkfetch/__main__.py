from bulkfetch.cli import main

main()
