from apportion.cli import main

main()
