from netsim.cli import main

main()
