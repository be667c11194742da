// Change detection for the job page's panels: a part is re-rendered only when what it shows has changed.

/** A fresh tracker: changed(key, value) is true the first time and whenever value's JSON differs from the
 * last one seen under key. */
export function changeTracker() {
  const renderedSignatures = {};
  return function changed(key, value) {
    const signature = JSON.stringify(value);
    if (renderedSignatures[key] === signature) return false;
    renderedSignatures[key] = signature;
    return true;
  };
}
