from slowcard.cli import main

main()
