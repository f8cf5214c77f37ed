"""Model providers behind one streaming interface, and the registry that names them."""
