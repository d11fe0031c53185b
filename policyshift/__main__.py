"""`python -m policyshift OVERRIDES`: the same as `python train.py OVERRIDES`."""
from policyshift import main

main()
