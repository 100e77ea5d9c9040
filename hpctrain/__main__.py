from .cli_start import main

main()
