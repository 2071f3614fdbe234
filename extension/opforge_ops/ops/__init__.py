"""Public operators, one module per op (function, nn.Module, fake and autograd registrations)."""
