"""The class lists of the segmentation sets, as the dense-CLIP papers name them to the text
tower: SCLIP's ``configs/cls_*.txt`` (Wang et al., ECCV 2024; reused by ClearCLIP, NACLIP,
ProxyCLIP), one class a line, in the label order of mmsegmentation's dataset classes. Where
SCLIP gives a class several names (VOC's "person, person in shirt, ..."), the first is kept.
"""

from __future__ import annotations

#: mmsegmentation's ``PascalVOCDataset.METAINFO['classes']``: the label order of VOC's masks.
VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car",
               "cat", "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person",
               "pottedplant", "sheep", "sofa", "train", "tvmonitor")
#: VOC's object classes as SCLIP names them (``cls_voc21.txt`` lines 2-21, first names); its
#: first line, 26 stuff words for the background, is not used (a threshold decides it).
VOC_NAMES = ("aeroplane", "bicycle", "bird", "ship", "bottle", "bus", "car", "cat", "chair",
             "cow", "table", "dog", "horse", "motorbike", "person", "pottedplant", "sheep",
             "sofa", "train", "television monitor")
#: PASCAL Context's 59 classes (``cls_context59.txt``; ``cls_context60.txt`` puts
#: "background" first).
CONTEXT_NAMES = (
    "aeroplane", "bag", "bed", "bedclothes", "bench", "bicycle", "bird", "boat", "book",
    "bottle", "building", "bus", "cabinet", "car", "cat", "ceiling", "chair", "cloth",
    "computer", "cow", "cup", "curtain", "dog", "door", "fence", "floor", "flower", "food",
    "grass", "ground", "horse", "keyboard", "light", "motorbike", "mountain", "mouse",
    "person", "plate", "platform", "pottedplant", "road", "rock", "sheep", "shelves",
    "sidewalk", "sign", "sky", "snow", "sofa", "table", "track", "train", "tree", "truck",
    "tvmonitor", "wall", "water", "window", "wood")
#: Cityscapes' 19 train ids (``cls_city_scapes.txt``).
CITYSCAPES_NAMES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "trafficlight", "trafficsign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
    "motorcycle", "bicycle")
#: ADE20K's 150 classes (``cls_ade20k.txt``).
ADE20K_NAMES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane",
    "grass", "cabinet", "sidewalk", "person", "earth", "door", "table", "mountain", "plant",
    "curtain", "chair", "car", "water", "painting", "sofa", "shelf", "house", "sea", "mirror",
    "rug", "field", "armchair", "seat", "fence", "desk", "rock", "wardrobe", "lamp", "bathtub",
    "railing", "cushion", "base", "box", "column", "signboard", "chestofdrawers", "counter",
    "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path", "stairs",
    "runway", "case", "pooltable", "pillow", "screendoor", "stairway", "river", "bridge",
    "bookcase", "blind", "coffeetable", "toilet", "flower", "book", "hill", "bench",
    "countertop", "stove", "palm", "kitchenisland", "computer", "swivelchair", "boat", "bar",
    "arcademachine", "hovel", "bus", "towel", "light", "truck", "tower", "chandelier",
    "awning", "streetlight", "booth", "televisionreceiver", "airplane", "dirttrack",
    "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet",
    "poster", "stage", "van", "ship", "fountain", "conveyerbelt", "canopy", "washer",
    "plaything", "swimmingpool", "stool", "barrel", "basket", "waterfall", "tent", "bag",
    "minibike", "cradle", "oven", "ball", "food", "step", "tank", "tradename", "microwave",
    "pot", "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture", "hood",
    "sconce", "vase", "trafficlight", "tray", "ashcan", "fan", "pier", "crtscreen", "plate",
    "monitor", "bulletinboard", "shower", "radiator", "glass", "clock", "flag")
#: COCO-Stuff's 171 train ids (``cls_coco_stuff.txt``).
COCO_STUFF_NAMES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "trafficlight", "firehydrant", "stopsign", "parkingmeter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sportsball", "kite",
    "baseballbat", "baseballglove", "skateboard", "surfboard", "tennisracket", "bottle",
    "wineglass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich",
    "orange", "broccoli", "carrot", "hotdog", "pizza", "donut", "cake", "chair", "couch",
    "pottedplant", "bed", "diningtable", "toilet", "tv", "laptop", "mouse", "remote",
    "keyboard", "cellphone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddybear", "hairdrier", "toothbrush", "banner", "blanket",
    "branch", "bridge", "building-other", "bush", "cabinet", "cage", "cardboard", "carpet",
    "ceiling-other", "ceiling-tile", "cloth", "clothes", "clouds", "counter", "cupboard",
    "curtain", "desk-stuff", "dirt", "door-stuff", "fence", "floor-marble", "floor-other",
    "floor-stone", "floor-tile", "floor-wood", "flower", "fog", "food-other", "fruit",
    "furniture-other", "grass", "gravel", "ground-other", "hill", "house", "leaves", "light",
    "mat", "metal", "mirror-stuff", "moss", "mountain", "mud", "napkin", "net", "paper",
    "pavement", "pillow", "plant-other", "plastic", "platform", "playingfield", "railing",
    "railroad", "river", "road", "rock", "roof", "rug", "salad", "sand", "sea", "shelf",
    "sky-other", "skyscraper", "snow", "solid-other", "stairs", "stone", "straw",
    "structural-other", "table", "tent", "textile-other", "towel", "tree", "vegetable",
    "wall-brick", "wall-concrete", "wall-other", "wall-panel", "wall-stone", "wall-tile",
    "wall-wood", "water-other", "waterdrops", "window-blind", "window-other", "wood")
#: COCO-Object's 80 object classes (``cls_coco_object.txt`` lines 2-81, first names: line 2
#: is "person, person in shirt, ..."; its line 1, 26 stuff words for the background, is not
#: used: a threshold decides it), in the label order of SCLIP's ``COCOObjectDataset``
#: (``custom_datasets.py`` line 42: background, then COCO-Stuff's first 80 classes).
COCO_OBJECT_NAMES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat",
    "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack",
    "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball",
    "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket",
    "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake",
    "chair", "couch", "potted plant", "bed", "dining table", "toilet", "tv", "laptop",
    "mouse", "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush")
