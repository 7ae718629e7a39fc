"""An image folder of digits at mixed sizes and aspect ratios: each 8 x 8
digit of the built-in set, enlarged 1-4x per side independently (so
squashed or stretched) and placed at a random spot of a noisy canvas of
random height and width (8 to 48 px each): ROOT/{train,test}/LABEL/N.png.
Images at their own shape (NaFlex) see each at its shape; square models
see it resized to a square."""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds


def write(root, data_dir=None, per_split=None, seed=0):
  """Writes the folder from digits' train and test splits (at most
  `per_split` images of each); returns {split: count}."""
  rng = np.random.default_rng(seed)
  counts = {}
  for split in ("train", "test"):
    builder = tfds.builder("digits", data_dir=data_dir)
    if builder.info.file_format.value == "array_record":
      source = builder.as_data_source(split)
    else:
      source = tfds.as_numpy(builder.as_dataset(split))
    count = 0
    for i, example in enumerate(source):
      if per_split is not None and i >= per_split:
        break
      count += 1
      digit = example["image"]
      folder = root / split / str(example["label"])
      folder.mkdir(parents=True, exist_ok=True)
      (folder / f"{i}.png").write_bytes(
          tf.io.encode_png(_placed(digit, rng)).numpy())
    counts[split] = count
  return counts


def _placed(digit, rng):
  """The digit (8 x 8 x 1 or 3, uint8) stretched and placed on a canvas."""
  digit = np.asarray(digit)
  if digit.shape[-1] == 1:
    digit = np.repeat(digit, 3, axis=-1)
  scale_y, scale_x = rng.integers(1, 5, size=2)
  big = np.repeat(np.repeat(digit, scale_y, axis=0), scale_x, axis=1)
  height = int(rng.integers(big.shape[0], max(big.shape[0], 48) + 1))
  width = int(rng.integers(big.shape[1], max(big.shape[1], 48) + 1))
  canvas = rng.integers(0, 40, (height, width, 3)).astype(np.uint8)
  top = int(rng.integers(0, height - big.shape[0] + 1))
  left = int(rng.integers(0, width - big.shape[1] + 1))
  canvas[top:top + big.shape[0], left:left + big.shape[1]] = np.maximum(
      canvas[top:top + big.shape[0], left:left + big.shape[1]], big)
  return canvas
