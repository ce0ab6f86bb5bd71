from hpcsuite.cli import main

main(prog_name="hpcsuite")
