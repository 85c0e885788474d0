"""One widget per panel of the gputop screen. Each holds the data it was last shown and
renders it for the width it gets; none reads the viewer state by itself."""
