"""``python -m kvlab.sim``: the PagedAttention paper's memory figures beside kvlab's."""

from kvlab.sim.simulator import main

main()
