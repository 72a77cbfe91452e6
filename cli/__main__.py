from hetrun.cli.app import main

main()
