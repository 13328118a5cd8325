"""The streams :func:`growmem.continual.streams.make_stream` builds, by name: importable without
torch or Avalanche, so that ``growmem continual`` checks a stream's name before it imports them."""
from __future__ import annotations

from typing import Dict

#: stream name -> one-line description
STREAMS: Dict[str, str] = {
    "split_mnist": "Split-MNIST: 5 experiences x 2 classes, class-incremental",
    "permuted_mnist": "Permuted-MNIST: 10 experiences, one pixel permutation each, domain-incremental",
    "rotated_mnist": "Rotated-MNIST: 10 experiences, one rotation each, domain-incremental",
    "split_cifar10": "Split-CIFAR10: 5 experiences x 2 classes, class-incremental (needs the CIFAR-10 files)",
    "split_cifar100": "Split-CIFAR100: 10 experiences x 10 classes, class-incremental (needs the CIFAR-100 files)",
    "drifting_teacher": "embedded drifting teacher: generated inputs, labels from a random network that "
                        "changes abruptly between experiences and gradually within one (no download)",
}
#: the streams built from the MNIST files (checked for before torch is imported)
MNIST_FAMILY = ("split_mnist", "permuted_mnist", "rotated_mnist")
