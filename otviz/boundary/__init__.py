"""The one input boundary: everything a person gives the app or the library passes here.

* :mod:`otviz.boundary.images`: uploads and image files decoded once, their pixel count and
  aspect ratio read from the header and limited before anything decodes them, every mode
  (16-bit, float, palette, EXIF-rotated, transparent) made 8-bit RGB by scaling, never
  clipping;
* :mod:`otviz.boundary.text`: captions (of text boxes and of uploaded files alike), phrases
  and word lists (letters of any script);
* :mod:`otviz.boundary.paths`: paths inside uploads and data roots confined by one function
  (a refused path and a missing one are the same "not found or not allowed"), uploads
  unpacked within a size cap, and server paths kept out of every message.

Views, datasets, training and the backbone call these functions, never their own copy;
``tests/ui/test_bad_inputs.py`` drives every event of the served app with a hostile
catalogue. The layer sits right above :mod:`otviz.errors` and imports nothing else of otviz.
"""
