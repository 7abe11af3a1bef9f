"""A chain of modules with forward(x, train) / backward(dy), named "0", "1", ... like torch's nn.Sequential
(ResNet stages `layerN` and the projection shortcut `downsample`)."""

from .module import Module


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def __iter__(self):
        return iter(self._children.values())

    def __len__(self):
        return len(self._children)

    def __getitem__(self, index):
        return list(self._children.values())[index]

    def forward(self, x, train: bool):
        for m in self._children.values():
            x = m.forward(x, train)
        return x

    def backward(self, dy):
        for m in reversed(list(self._children.values())):
            dy = m.backward(dy)
        return dy
