from hetrun.cli.entry import main

main()
