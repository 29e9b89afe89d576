"""``python -m kvlab.sim``: the PagedAttention paper's memory figures beside kvlab's."""

from kvlab.sim.paper import main

main()
